"""curvine.client"""
