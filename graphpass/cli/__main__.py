"""``python -m graphpass.cli``: the console script, for tests and checkouts
without an install. Nothing else belongs here."""

from graphpass.cli.entry import entry_point

if __name__ == "__main__":
    entry_point()
