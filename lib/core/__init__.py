"""What every layer above uses: files written whole, params read and checked, signals, the process group."""
