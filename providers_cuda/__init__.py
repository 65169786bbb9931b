"""The CuPy provider. Importable without CuPy; unavailable (with the reason) until then."""
