"""trainer.features"""
