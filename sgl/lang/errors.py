"""`ProgramError`, on its own so that the executor, its gen/select calls and the program
state raise one class without importing each other."""


class ProgramError(RuntimeError):
    """A program failed; the original exception is the __cause__."""
