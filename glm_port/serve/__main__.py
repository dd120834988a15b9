import sys

from glm_port.serve.cli import main

sys.exit(main())
