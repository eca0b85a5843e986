"""``python -m hosts.agent``: see hosts.agent.server.main."""

import sys

from hosts.agent.server import main

sys.exit(main())
