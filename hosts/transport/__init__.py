"""How the panel reaches a host: ``Transport`` (base.py) with an agent client (agent.py) and
an SSH implementation (the ssh/ package)."""
