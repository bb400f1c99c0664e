"""curvine.fuse_client"""
