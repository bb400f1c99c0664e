"""curvine.cli"""
