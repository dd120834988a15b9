"""``python -m migrate.mock.selfcheck``: the first name of ``python -m harness.selfcheck``.

The run against a THUDM/GLM checkout lives in the harness (``harness/``); this entry point
is kept so that the documented command goes on working.
"""

import sys

from harness.selfcheck import main

if __name__ == "__main__":
    sys.exit(main())
