"""LightningDataModules, one file each; conf/data/<name>.yaml names one by `_target_`."""
