"""curvine.worker"""
