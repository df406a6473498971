"""trainer.sim"""
