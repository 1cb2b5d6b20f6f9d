from fleet_api.cli import main

main(prog_name="fleet")
