"""trainer.folds"""
