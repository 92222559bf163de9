"""The one exception type that means "the user asked for something we cannot do".

The CLI turns a UserError into one line on stderr and exit code 2 (a subclass may set another
`exit_code`: record.ResultsFileError's 1), with no traceback; every other exception is a bug and
keeps its traceback.
"""


class UserError(Exception):
    """Bad input. The message names the fix, e.g. "unknown attention 'sdp'; choose one of: ..."."""
