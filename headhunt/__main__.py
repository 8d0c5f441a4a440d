import os
import sys

from headhunt.cli import main

code = main()
if os.environ.get("HEADHUNT_RANK_ERRORS"):
    # A worker of `--nproc` (headhunt.distributed.launch): its files are written and its
    # process group met its last barrier. It ends without the interpreter's teardown, where
    # gloo's destructors can abort ("terminate called without an active exception") when a
    # peer has already closed its connections.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
sys.exit(code)
