from eaglegate.cli import main

main()
