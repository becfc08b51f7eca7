"""memlab's engine: config, model, attention, data, training loop, meters, run store, compare.

Never imports textual, typer or rich: the engine runs headless on a bare GPU image.
"""
