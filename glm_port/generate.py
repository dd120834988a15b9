"""``python -m glm_port.generate`` (and ``torchrun ... -m glm_port.generate``): ``glm-generate``."""

from glm_port.generation.cli import main

if __name__ == "__main__":
    main()
