"""numba jit code only; the launchers are kernels/cpu/decode.py and kernels/cpu/pack.py. Importing these modules
needs numba (contract.py excepted); nothing else in `kernels` does.
"""
