from hvdtrain.cli import run

run()
