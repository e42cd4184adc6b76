"""Process plumbing every part shares: /proc and signal helpers (`procutil`), and a child
process in its own group that prints a ready line (`managed`). Standard library only, so the
agent PEX's pre-forked worker can carry it."""
