"""The generic kernel library: one op per ``op_*`` module, written against the array API.

Each builder gets the provider's array namespace ``xp`` (NumPy, CuPy, or any
namespace that follows the Python array API standard) and must compute with
it alone, through :mod:`onnxep.providers.ops._xp` where the standard falls short.
"""
