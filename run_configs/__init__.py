"""The run configs that ship with Rescore (package data): `rescore configs` lists them, `--config NAME` takes one."""
