import sys

from flowforge.server.main import main

sys.exit(main())
