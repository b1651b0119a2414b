"""What the end-to-end scenarios measured, said at once and again in pytest's terminal summary."""

#: lines printed in pytest's terminal summary (conftest), one block per scenario run
SUMMARY: list[str] = []


def report(line: str) -> None:
    """``line`` at once (under ``-s``) and again in the terminal summary."""
    SUMMARY.append(line)
    print("\n" + line)
