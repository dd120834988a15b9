from glm_port.finetune.run import main

main()
