from validator.entrypoint import main

main()
