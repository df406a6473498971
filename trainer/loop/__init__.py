"""trainer.loop"""
