"""hicache-sim: a faithful model of SGLang HiCache (HiRadixCache v0.5.14).

Kept deliberately light: importing ``sim`` loads nothing heavy, so ``import sim.policy`` pulls in
neither SimPy nor pandas.
"""

__version__ = "0.1.0"
