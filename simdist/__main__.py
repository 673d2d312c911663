from simdist.cli import main

main()
