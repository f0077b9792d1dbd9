"""The ParaDL analytic oracle (Kahira et al., HPDC 2021), its platforms, its Table VIII replay."""
