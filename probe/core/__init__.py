"""What every analysis shares, one concern a module: gates, meta, seeds, rows, lengths, chance, batches, stats."""
