"""Exactness against one device: the float64 reference run and the fp32 accuracy bound."""
