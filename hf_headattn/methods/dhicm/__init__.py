"""DHICM (Goindani & Shrivastava 2021): dynamic head importance, one folder (README.md lists its files).

The model side (`core`: settings, the attached module, Eq. 1-5) is what the model and a checkpoint's remote code
import; the kit (`kit`, `analysis`) only the recipes do. Importing this package imports neither.
"""
