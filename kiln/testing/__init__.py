"""Testing helpers: the model zoo (zoo.py, zoo_torch.py), the differential fuzzer (fuzz.py,
``python -m kiln.testing.fuzz``), kiln bisect (bisect.py)."""
