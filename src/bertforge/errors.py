"""The one exception type for mistakes a user can fix (bad input, impossible settings).

The CLI catches `BertforgeError`, prints its message and exits non-zero without a traceback.
Internal invariants use `assert`; anything else that escapes is a bug and keeps its traceback.
"""


class BertforgeError(Exception):
    """A problem with the user's input or settings; the message names it and says how to fix it."""
