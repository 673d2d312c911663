from simdist.cli import console

console()
