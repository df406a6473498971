"""trainer.report"""
