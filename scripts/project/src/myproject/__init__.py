"""myproject: the LightningModules (models/) and DataModules (data/) that conf/ names; the Lightspeed
engine, pinned in pyproject.toml, runs them."""
