"""What every curvine process needs: config, errors, ids, logging and RPC plumbing."""
