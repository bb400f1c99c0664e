"""curvine.master"""
