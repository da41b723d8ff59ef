"""What every layer may use: settings, errors, wire contracts, JSON codec, outbound HTTP, rubrics."""
