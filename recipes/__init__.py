"""Recipes: one module per model and data set, each defining `RECIPE`.

Installed as the package `hvdtrain.recipes`; each module also runs on its own:
`horovodrun -np 2 -H localhost:2 python recipes/NAME.py [flags]`.
"""
