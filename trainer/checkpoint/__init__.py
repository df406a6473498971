"""trainer.checkpoint"""
