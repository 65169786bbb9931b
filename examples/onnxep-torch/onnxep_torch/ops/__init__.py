"""Torch-native kernels, one ``op_*`` module per family; they replace the generic ones.

Each op here is claimed whatever ``verified.py`` says: these kernels call
torch directly instead of going through the array API.
"""
