"""The modes a Trainer runs."""
from . import _C

# From the library's one mode table (src/mode.cpp), auto first: the Trainer's own choice.
MODES = ("auto",) + tuple(name for name, _, _ in _C.modes())
_GRAPHED = tuple(name for name, _, graphs in _C.modes() if graphs)
