"""The hardware: cluster specs and presets, shared ports, the device model, link calibration,
rendezvous, this machine's memory."""
