"""numba jit code only; the launchers are kernels/cpu/decode.py, kernels/cpu/pack.py and kernels/cpu/step.py. Importing these modules
needs numba (contract.py excepted); nothing else in `kernels` does.
"""
