"""LightningModules, one file each; conf/model/<name>.yaml names one by `_target_`."""
