"""curvine.journal"""
