"""The measuring core: Timer -> Measurement (timing), backends timed round by round (interleaved),
intervals and labels (stats), device state beside each row (devstate). Imports nothing of flyexplore
above the root's errors/parsing; never the catalogue, the explainer, figures or widgets.
"""
