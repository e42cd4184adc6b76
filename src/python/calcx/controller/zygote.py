"""``python -m calcx.controller.zygote``: the pre-forked agent worker's command (the controller's
default ``--worker-cmd``; ``PEX_MODULE=calcx.controller.zygote agent.pex`` in the image). The
worker itself is :mod:`calcx.worker`; this name stays because commands in use spell it."""

import sys

from calcx.worker.main import main

if __name__ == "__main__":
    sys.exit(main())
