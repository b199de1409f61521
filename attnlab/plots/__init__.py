"""Matplotlib figures for attnlab (drawn on ``matplotlib.figure.Figure`` objects with the Agg
canvas: no pyplot state). ``attnlab.plots.scaling``: scaling-law figures;
``attnlab.plots.extrapolation``: length-extrapolation figures."""
