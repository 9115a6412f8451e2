"""LightningModules; plain nn.Modules live in `nets/`, one file each."""
