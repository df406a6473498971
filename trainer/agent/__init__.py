"""trainer.agent"""
