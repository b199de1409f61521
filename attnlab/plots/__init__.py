"""Matplotlib figures for attnlab (drawn on ``matplotlib.figure.Figure`` objects with the Agg
canvas: no pyplot state). ``attnlab.plots.scaling``: scaling-law figures;
``attnlab.plots.extrapolation``: length-extrapolation figures;
``attnlab.plots.positions``: what a positional encoding does with positions."""
