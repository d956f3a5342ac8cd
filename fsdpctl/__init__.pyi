# For type checkers and editors: at run time these names load on first use (see __init__.py).
from .api import *  # noqa: F403
from .api import __all__ as PUBLIC_NAMES  # noqa: F401

__version__: str
